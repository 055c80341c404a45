# TLS for a client agent (put it beside client-gpu.hcl or client-cpu.hcl in
# /etc/nomad.d/; the agent loads every file there). Servers carry their own
# tls block in server.hcl.
#
# Certificates, from the CA's machine (`nomad tls` ships with Nomad):
#
#   nomad tls ca create                       # nomad-agent-ca.pem, nomad-agent-ca-key.pem
#   nomad tls cert create -server -region global  # for each server
#   nomad tls cert create -client             # global-client-nomad.pem (+ -key.pem)
#
# and install them under the names below, the key readable by the agent only.
# verify_server_hostname makes a client refuse anything but a server
# certificate for this region (server.global.nomad), so a stolen client
# certificate cannot pose as a server; verify_https_client refuses HTTP
# callers without a certificate from this CA (llmgw presents one:
# scheduler.nomad.client_cert/client_key).

tls {
  http = true
  rpc  = true

  ca_file   = "/etc/nomad.d/tls/nomad-ca.pem"
  cert_file = "/etc/nomad.d/tls/client.pem"
  key_file  = "/etc/nomad.d/tls/client-key.pem"

  verify_server_hostname = true
  verify_https_client    = true
}
