# A CPU-only client (llama.cpp models such as embeddings). Same cache volume
# as the GPU clients; no device plugin. Its TLS is in tls.hcl (put both in
# /etc/nomad.d/ and run `nomad agent -config=/etc/nomad.d/`).

datacenter = "dc1"
data_dir   = "/opt/nomad/data"

# Clients enforce ACLs too: the allocation file system, logs and exec go
# through the client's own HTTP API, which checks tokens only when this is on.
acl {
  enabled = true
}

client {
  enabled    = true
  node_class = "cpu"
  servers    = ["nomad-1.internal:4647", "nomad-2.internal:4647", "nomad-3.internal:4647"]

  # Create it before the agent starts (a missing path keeps the client from
  # starting), owned by the fetch task's user (scheduler.nomad.fetch_user); Nomad
  # never creates or chowns it:
  #   sudo install -d -o 10001 -g 10001 -m 0755 /var/lib/llmgw/model-cache
  host_volume "llmgw-model-cache" {
    path      = "/var/lib/llmgw/model-cache"
    read_only = false
  }

  reserved {
    cores  = "0-1"
    memory = 8192
  }
}

plugin "docker" {
  config {
    allow_privileged = false
  }
}
