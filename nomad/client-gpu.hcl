# A GPU client of a production cluster (one per GPU machine), e.g. an HGX
# H100 box. Its TLS is in tls.hcl (put both in /etc/nomad.d/); the servers'
# configuration is server.hcl.
#
#   nomad agent -config=/etc/nomad.d/   (this file, tls.hcl; plugins in plugin_dir)

datacenter = "dc1"
data_dir   = "/opt/nomad/data"
plugin_dir = "/opt/nomad/plugins"   # holds the nomad-device-nvidia binary

# Clients enforce ACLs too: the allocation file system, logs and exec go
# through the client's own HTTP API, which checks tokens only when this is on.
acl {
  enabled = true
}

client {
  enabled    = true
  node_class = "gpu-h100"
  servers    = ["nomad-1.internal:4647", "nomad-2.internal:4647", "nomad-3.internal:4647"]

  # The node-local model cache the prestart task `llmgw fetch` fills and the
  # engine reads; the name is scheduler.nomad.cache_volume. Put it on local
  # NVMe: a 70B model is 140 GB read at every start.
  # Create it before the agent starts (a missing path keeps the client from
  # starting), owned by the fetch task's user (scheduler.nomad.fetch_user); Nomad
  # never creates or chowns it:
  #   sudo install -d -o 10001 -g 10001 -m 0755 /var/lib/llmgw/model-cache
  host_volume "llmgw-model-cache" {
    path      = "/var/lib/llmgw/model-cache"
    read_only = false
  }

  # llmgw_fabric: the interconnect group a profile's `fabric` names. A replica
  # with tensor parallelism never leaves one node, but models that are placed
  # together expect one fabric; set it per island (ib-a, ib-b, ...).
  # llmgw_gpu_class: the gpu_classes entry this card is. Jobs are constrained on
  # the device string itself, but this meta is what marks a GPU node: CPU models
  # keep off nodes that carry it (unless their profile sets gpu_nodes: true), so
  # every GPU client must set it and no CPU client may.
  meta {
    llmgw_fabric    = "ib-a"
    llmgw_gpu_class = "h100-80g"
  }

  # Cores 0-1 and 16 GiB stay with the OS, the agent and the NVIDIA daemons.
  reserved {
    cores  = "0-1"
    memory = 16384
  }
}

# NVIDIA's device plugin reports each card by its NVML name ("NVIDIA H100
# 80GB HBM3") and memory in MiB; llmgw's gpu_classes must use those strings.
plugin "nomad-device-nvidia" {
  config {
    enabled            = true
    fingerprint_period = "1m"
  }
}

plugin "docker" {
  config {
    # The device plugin hands the container NVIDIA_VISIBLE_DEVICES; the docker
    # driver then runs it with this runtime (install nvidia-container-toolkit).
    nvidia_runtime   = "nvidia"
    allow_privileged = false
  }
}
