# A one-machine Nomad for trying llmgw's Nomad mode (beside docker-compose.yml):
# server and client in one agent, the docker driver, the host volume the
# prestart fetcher fills, and the node meta llmgw's jobs are constrained on.
# Run it on the host, not in a container (docker-compose.yml says why):
#
#   sudo install -d -o 10001 -g 10001 -m 0755 /var/lib/llmgw/model-cache
#   sudo nomad agent -dev -config nomad/dev.hcl
#
# The cache directory belongs to uid 10001, the user llmgw's fetch task runs as
# (scheduler.nomad.fetch_user): Nomad stats a host volume's path when the agent
# starts and mounts it as it is, never creating or chowning it.
#
# bind_addr 0.0.0.0: -dev alone binds 127.0.0.1, and replicas would then be
# registered at an address only this machine's loopback reaches.

datacenter = "dc1"
data_dir   = "/tmp/nomad/data"
bind_addr  = "0.0.0.0"

ports {
  http = 4646
  rpc  = 4647
  serf = 4648
}

server {
  enabled          = true
  bootstrap_expect = 1
}

client {
  enabled = true

  # The node-local model cache. Every llmgw job mounts it at /llmgw-cache; the
  # name must equal scheduler.nomad.cache_volume in llmgw's configuration.
  host_volume "llmgw-model-cache" {
    path      = "/var/lib/llmgw/model-cache"
    read_only = false
  }

  # Read by llmgw's fleet view and placement: the fabric a GPU profile may ask
  # for (scheduler.nomad.fabric_meta_key). No llmgw_gpu_class: that meta marks a
  # GPU node, and CPU models keep off nodes that carry it.
  meta {
    llmgw_fabric = "dev"
  }

  # Keep two cores and 2 GiB for the agent and the OS; llmgw's replicas
  # reserve whole cores out of the rest.
  reserved {
    cores  = "0-1"
    memory = 2048
  }
}

plugin "docker" {
  config {
    allow_privileged = false
    volumes {
      enabled = false
    }
  }
}
