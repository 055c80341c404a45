# A production server (run three). llmgw talks to any of them over HTTPS
# with an ACL token holding the policy in llmgw-policy.hcl. The certificates
# are made as the README's production steps say; ca_file is the one CA of
# every agent (tls.hcl names the same file) and of every HTTP caller.

datacenter = "dc1"
data_dir   = "/opt/nomad/data"

server {
  enabled          = true
  bootstrap_expect = 3
  server_join {
    retry_join = ["nomad-1.internal", "nomad-2.internal", "nomad-3.internal"]
  }
}

acl {
  enabled = true
}

tls {
  http      = true
  rpc       = true
  ca_file   = "/etc/nomad.d/tls/nomad-ca.pem"
  cert_file = "/etc/nomad.d/tls/server.pem"
  key_file  = "/etc/nomad.d/tls/server-key.pem"

  # RPC between agents, not the HTTP API. With it this server takes Raft only
  # from a certificate valid for server.<region>.nomad (nomad/rpc.go
  # validateRaftTLS), answers the RPCs meant for agents only to a certificate of
  # client.<region>.nomad or server.<region>.nomad (nomad/server.go passes it to
  # the authenticator as VerifyTLS; nomad/auth/auth.go verifyTLS), and expects
  # server.<region>.nomad of each server it calls (helper/tlsutil/config.go
  # OutgoingTLSWrapper). So a client agent's certificate cannot act as a server,
  # nor an HTTP caller's as an agent. Client agents set it too (tls.hcl).
  # rpc_upgrade_mode stays off: it accepts plaintext RPC and skips the Raft
  # check, for the hours of a migration to TLS only.
  verify_server_hostname = true

  # The HTTP API: every caller presents a certificate signed by ca_file or the
  # handshake fails (helper/tlsutil/config.go IncomingTLSConfig,
  # RequireAndVerifyClientCert). Those callers are llmgw
  # (scheduler.nomad.client_cert/client_key), Prometheus's Nomad discovery
  # (deploy/prometheus.yml tls_config), the nomad CLI (NOMAD_CLIENT_CERT and
  # NOMAD_CLIENT_KEY) and a browser opening the UI: each gets a
  # `nomad tls cert create -cli` certificate, never an agent's.
  verify_https_client = true
}
