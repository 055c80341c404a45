# TLS for a client agent (put it beside client-gpu.hcl or client-cpu.hcl in
# /etc/nomad.d/; the agent loads every file there). Servers carry their own
# tls block in server.hcl, with the same CA. The README's production steps
# make the certificates (`nomad tls cert create -client` for this agent) and
# say where each file goes; the key is readable by the agent only.

tls {
  http = true
  rpc  = true

  ca_file   = "/etc/nomad.d/tls/nomad-ca.pem"
  cert_file = "/etc/nomad.d/tls/client.pem"
  key_file  = "/etc/nomad.d/tls/client-key.pem"

  # RPC to the servers, not the HTTP API: this agent accepts only a server
  # certificate of its region (server.global.nomad) from the server it calls
  # (helper/tlsutil/config.go OutgoingTLSWrapper), so a stolen client
  # certificate cannot pose as a server. The servers set it too (server.hcl).
  verify_server_hostname = true

  # This agent's own HTTP API refuses callers without a certificate from this
  # CA, as the servers' does. The CLI's `nomad alloc logs` and `alloc fs` call
  # the node directly, expecting client.global.nomad (api/fs.go
  # queryClientNode; api/api.go ClientConfig): the same `-cli` certificate
  # serves both.
  verify_https_client = true
}
