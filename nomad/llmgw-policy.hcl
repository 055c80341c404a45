# The ACL policy llmgw's token needs (scheduler.nomad.token / NOMAD_TOKEN):
#
#   nomad acl policy apply -namespace llm llmgw nomad/llmgw-policy.hcl
#   nomad acl token create -name llmgw -policy llmgw
#
# register, plan, validate and deregister jobs; scale them; read allocations,
# their checks and statistics, evaluations and services; read nodes for the
# fleet view.

namespace "llm" {
  capabilities = ["list-jobs", "read-job", "submit-job", "scale-job", "read-job-scaling"]
}

# The fleet view counts every allocation on a node, whatever its namespace;
# without read access to the others, their capacity would look free.
namespace "*" {
  capabilities = ["list-jobs", "read-job"]
}

node {
  policy = "read"
}
