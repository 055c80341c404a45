# The ACL policy of llmgw's own token (scheduler.nomad.token / NOMAD_TOKEN).
# Replace "llm" with scheduler.nomad.namespace. Apply it as a plain policy and
# hand it to one token:
#
#   nomad acl policy apply -description "llmgw control plane" llmgw nomad/llmgw-policy.hcl
#   nomad acl token create -name llmgw -policy llmgw
#
# Never add -namespace, -job, -group or -task to the apply: those attach the
# policy to *workloads* (command/acl_policy_apply.go, Run, sets the policy's
# JobACL; nomad/auth/auth.go, ResolvePoliciesForClaims). With -namespace alone
# the JobACL has no job, and every task running in that namespace -- every
# model replica, and whatever else runs there -- would be able to register,
# scale and stop jobs and read the credentials llmgw keeps in Nomad Variables.
# A token's policies are found by name whatever their JobACL; the flags only
# ever add holders.

namespace "llm" {
  # register, plan, validate and deregister jobs; scale them and read their
  # scale status; read jobs, allocations, their checks and statistics,
  # evaluations, deployments and services. Every gateway instance uses
  # submit-job, read-job and read-fs too, to fetch an adapter onto a replica's
  # node and read why a fetch failed.
  capabilities = ["list-jobs", "read-job", "submit-job", "scale-job", "read-job-scaling",
                  # read a file of llmgw's own allocations: the fetch's progress and the
                  # cache sweep's report (command/agent/fs_endpoint.go, the cat/ case)
                  "read-fs"]

  # The credentials each model's fetch task reads (a mirror or source password,
  # HF_TOKEN), kept at nomad/jobs/llmgw-<model>: llmgw writes them there, and a
  # task reads only its own job's path (its workload identity's implicit
  # access, acl/acl.go matchingVariablesCapabilitySet). "*" matches "/" too.
  variables {
    path "nomad/jobs/llmgw-*" {
      capabilities = ["write", "read", "destroy"]
    }
    # The same credentials, for the batch job that fetches a model's weights ahead
    # (job llmgw_prefetch_<model>: a Variable path allows no dot, and the underscore
    # keeps it out of the llmgw-* glob above).
    path "nomad/jobs/llmgw_prefetch_*" {
      capabilities = ["write", "read", "destroy"]
    }
    # ... and for the batch job that fetches a LoRA adapter onto the node of the replica
    # about to load it (job llmgw_adapter_<adapter>_<node ID>, llmgw/scheduler/nomad/
    # adapterjob.py), when the mirror or the adapter's URL has a password.
    path "nomad/jobs/llmgw_adapter_*" {
      capabilities = ["write", "read", "destroy"]
    }
  }
}

# Every job llmgw registers -- a model's replicas, a prefetch, a cache sweep, an
# adapter's fetch -- mounts
# the host volume llmgw-model-cache (scheduler.nomad.cache_volume) writable, and
# Job.Register checks each mount against the token's host_volume rules, which no
# namespace capability covers (nomad/job_endpoint.go, doRegister; acl/acl.go,
# AllowHostVolumeOperation): without this block every register is refused with 403,
# while a plan, which checks no volume, still passes. mount-readwrite is the one
# capability a writable mount needs, and grants nothing on any other volume. Rename
# it with scheduler.nomad.cache_volume.
host_volume "llmgw-model-cache" {
  capabilities = ["mount-readwrite"]
}

# What this grants, and why it is here: read-job in every namespace lets the
# token read every job's full specification (environment, task config and
# inline templates included, so any secret another team wrote into a job spec),
# every allocation with its node, address and ports, evaluations, deployments
# and service registrations -- everywhere. llmgw needs it for one thing: the
# fleet view counts what every allocation on a node holds, and Nomad silently
# leaves out allocations of namespaces the token cannot read
# (nomad/node_endpoint.go, GetAllocs; nomad/alloc_endpoint.go, List), so their
# GPUs would look free. Remove this block if that exposure is not acceptable:
# Nomad's own placement is unaffected; only llmgw's fleet view and its
# "waiting for capacity" reasons then miss what other namespaces use.
namespace "*" {
  capabilities = ["read-job"]
}

# Write, to record which model weights each node's cache holds in the node's
# dynamic metadata (llmgw_cache_<model>), which the jobs' affinities read. Nomad
# asks node:write of /v1/client/metadata (nomad/client_meta_endpoint.go,
# NodeMeta.Apply) and has nothing narrower: the same level drains nodes and marks
# them ineligible. llmgw holds it here, in the one process that already submits
# jobs, rather than handing it to every fetch task on every node
# (llmgw/scheduler/nomad/warmth.py argues it). Set it to "read" to do without: jobs
# then never prefer warm nodes, and prefetched weights only help by chance.
node {
  policy = "write"
}
