# A production server (run three). llmgw talks to any of them over HTTPS
# with an ACL token holding the policy in llmgw-policy.hcl.

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
  # llmgw presents a client certificate (scheduler.nomad.client_cert/client_key).
  verify_https_client = true
}
