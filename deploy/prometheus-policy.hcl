# The ACL policy of Prometheus's Nomad token (deploy/prometheus.yml). Replace "llm"
# with llmgw's scheduler.nomad.namespace. Apply it as a plain policy and hand it to
# one token:
#
#   nomad acl policy apply -description "Prometheus service discovery" prometheus deploy/prometheus-policy.hcl
#   nomad acl token create -name prometheus -policy prometheus
#
# nomad_sd_configs lists services (GET /v1/services) and reads each one
# (GET /v1/service/:name). Nomad allows both with read-job in the namespace and has
# nothing narrower (nomad/service_registration_endpoint.go, List and GetService;
# acl/acl.go, AllowServiceRegistrationReadList). So this token can also read the
# namespace's job specifications and allocations: keep it where Prometheus's own
# secrets are kept. It can submit, scale or stop nothing. Never add -namespace or -job
# to the apply: that would hand the policy to every task in the namespace
# (nomad/llmgw-policy.hcl explains).
#
# If the DCGM exporter runs in another namespace, add a block for it too.

namespace "llm" {
  capabilities = ["read-job"]
}
