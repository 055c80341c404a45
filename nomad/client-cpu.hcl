# A CPU-only client (llama.cpp models such as embeddings). Same cache volume
# as the GPU clients; no device plugin.

datacenter = "dc1"
data_dir   = "/opt/nomad/data"

client {
  enabled    = true
  node_class = "cpu"
  servers    = ["nomad-1.internal:4647", "nomad-2.internal:4647", "nomad-3.internal:4647"]

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
