"""The request shapes Nomad's HTTP agent decodes, as Go field names and Go types.

``REFERENCE`` is copied field for field from ``docs/nomad-api-fields.json``
(the ``api/*.go`` structs of hashicorp/nomad @ aa026cc9), with the json-tag renames
already applied; a test compares the two whenever the reference file is present, so
the fake cannot drift from the contract the Nomad client is written against.

The reference names some nested structs without listing their fields (a task's
``Lifecycle``, a group's ``Volumes``, ``VolumeMounts``…). ``SUPPLEMENT`` gives those
from the same ``api/*.go`` files at the same commit, because a job that mounts the
model cache or runs a prestart fetcher uses exactly these. Structs llmgw has no reason
to send (Consul Connect, Vault identities, multiregion…) are ``OPAQUE``: any JSON
object is accepted there, since inventing their fields would make the fake stricter
than Nomad for no benefit.

Types keep their Go spelling (``*int``, ``[]*Constraint``, ``map[string]*VolumeRequest``,
``time.Duration``) so decode errors can quote the type exactly as Go's encoding/json does.
"""

from __future__ import annotations

REFERENCE: dict[str, dict[str, str]] = {
    "JobRegisterRequest": {
        "Submission": "*JobSubmission", "Job": "*Job", "EnforceIndex": "bool",
        "JobModifyIndex": "uint64", "PolicyOverride": "bool", "PreserveCounts": "bool",
        "PreserveResources": "bool", "EvalPriority": "int", "Region": "string",
        "Namespace": "string", "SecretID": "string",
    },
    "Job": {
        "Region": "*string", "Namespace": "*string", "ID": "*string", "Name": "*string",
        "Type": "*string", "Priority": "*int", "AllAtOnce": "*bool", "Datacenters": "[]string",
        "NodePool": "*string", "Constraints": "[]*Constraint", "Affinities": "[]*Affinity",
        "TaskGroups": "[]*TaskGroup", "Update": "*UpdateStrategy", "Multiregion": "*Multiregion",
        "Spreads": "[]*Spread", "Periodic": "*PeriodicConfig",
        "ParameterizedJob": "*ParameterizedJobConfig", "Reschedule": "*ReschedulePolicy",
        "Migrate": "*MigrateStrategy", "Meta": "map[string]string", "UI": "*JobUIConfig",
        "Stop": "*bool", "ParentID": "*string", "Dispatched": "bool",
        "DispatchIdempotencyToken": "*string", "Payload": "[]byte", "ConsulNamespace": "*string",
        "VaultNamespace": "*string", "NomadTokenID": "*string", "Status": "*string",
        "StatusDescription": "*string", "Stable": "*bool", "Version": "*uint64",
        "SubmitTime": "*int64", "CreateIndex": "*uint64", "ModifyIndex": "*uint64",
        "JobModifyIndex": "*uint64", "VersionTag": "*JobVersionTag",
    },
    "TaskGroup": {
        "Name": "*string", "Count": "*int", "Constraints": "[]*Constraint",
        "Affinities": "[]*Affinity", "Tasks": "[]*Task", "Spreads": "[]*Spread",
        "Volumes": "map[string]*VolumeRequest", "RestartPolicy": "*RestartPolicy",
        "Disconnect": "*DisconnectStrategy", "ReschedulePolicy": "*ReschedulePolicy",
        "EphemeralDisk": "*EphemeralDisk", "Update": "*UpdateStrategy",
        "Migrate": "*MigrateStrategy", "Networks": "[]*NetworkResource",
        "Meta": "map[string]string", "Services": "[]*Service", "ShutdownDelay": "*time.Duration",
        "MaxRunDuration": "*time.Duration", "StopAfterClientDisconnect": "*time.Duration",
        "MaxClientDisconnect": "*time.Duration", "Scaling": "*ScalingPolicy",
        "Consul": "*Consul", "PreventRescheduleOnLost": "*bool",
    },
    "Task": {
        "Name": "string", "Driver": "string", "User": "string", "Lifecycle": "*TaskLifecycle",
        "Config": "map[string]any", "Constraints": "[]*Constraint", "Affinities": "[]*Affinity",
        "Env": "map[string]string", "Services": "[]*Service", "Resources": "*Resources",
        "RestartPolicy": "*RestartPolicy", "Meta": "map[string]string",
        "KillTimeout": "*time.Duration", "LogConfig": "*LogConfig",
        "Artifacts": "[]*TaskArtifact", "Vault": "*Vault", "Consul": "*Consul",
        "Templates": "[]*Template", "DispatchPayload": "*DispatchPayloadConfig",
        "VolumeMounts": "[]*VolumeMount", "CSIPluginConfig": "*TaskCSIPluginConfig",
        "Leader": "bool", "ShutdownDelay": "time.Duration", "KillSignal": "string",
        "Kind": "string", "ScalingPolicies": "[]*ScalingPolicy", "Secrets": "[]*Secret",
        "Identity": "*WorkloadIdentity", "Identities": "[]*WorkloadIdentity",
        "Actions": "[]*Action", "Schedule": "*TaskSchedule",
    },
    "Resources": {
        "CPU": "*int", "Cores": "*int", "MemoryMB": "*int", "MemoryMaxMB": "*int",
        "DiskMB": "*int", "Networks": "[]*NetworkResource", "Devices": "[]*RequestedDevice",
        "NUMA": "*NUMAResource", "SecretsMB": "*int", "IOPS": "*int",
    },
    "RequestedDevice": {
        "Name": "string", "Count": "*uint64", "Constraints": "[]*Constraint",
        "Affinities": "[]*Affinity",
    },
    "Constraint": {
        "LTarget": "string", "RTarget": "string", "Operand": "string",
    },
    "Affinity": {
        "LTarget": "string", "RTarget": "string", "Operand": "string", "Weight": "*int8",
    },
    "Spread": {
        "Attribute": "string", "Weight": "*int8", "SpreadTarget": "[]*SpreadTarget",
    },
    "SpreadTarget": {
        "Value": "string", "Percent": "uint8",
    },
    "Service": {
        "Name": "string", "Tags": "[]string", "CanaryTags": "[]string",
        "EnableTagOverride": "bool", "PortLabel": "string", "AddressMode": "string",
        "Address": "string", "Checks": "[]ServiceCheck", "CheckRestart": "*CheckRestart",
        "Connect": "*ConsulConnect", "Meta": "map[string]string",
        "CanaryMeta": "map[string]string", "TaggedAddresses": "map[string]string",
        "TaskName": "string", "OnUpdate": "string", "Identity": "*WorkloadIdentity",
        "Weights": "*ServiceWeights", "Provider": "string", "Cluster": "string",
        "Kind": "string",
    },
    "ServiceCheck": {
        "Name": "string", "Type": "string", "Command": "string", "Args": "[]string",
        "Path": "string", "Protocol": "string", "PortLabel": "string", "Expose": "bool",
        "AddressMode": "string", "Advertise": "string", "Interval": "time.Duration",
        "Timeout": "time.Duration", "InitialStatus": "string", "Notes": "string",
        "TLSServerName": "string", "TLSSkipVerify": "bool", "Header": "map[string][]string",
        "Method": "string", "CheckRestart": "*CheckRestart", "GRPCService": "string",
        "GRPCUseTLS": "bool", "TaskName": "string", "SuccessBeforePassing": "int",
        "FailuresBeforeCritical": "int", "FailuresBeforeWarning": "int", "Body": "string",
        "OnUpdate": "string",
    },
    "CheckRestart": {
        "Limit": "int", "Grace": "*time.Duration", "IgnoreWarnings": "bool",
    },
    "NetworkResource": {
        "Mode": "string", "Device": "string", "CIDR": "string", "IP": "string",
        "DNS": "*DNSConfig", "ReservedPorts": "[]Port", "DynamicPorts": "[]Port",
        "Hostname": "string", "MBits": "*int", "CNI": "*CNIConfig",
    },
    "Port": {
        "Label": "string", "Value": "int", "To": "int", "HostNetwork": "string",
        "IgnoreCollision": "bool",
    },
    "UpdateStrategy": {
        "Stagger": "*time.Duration", "MaxParallel": "*int", "HealthCheck": "*string",
        "MinHealthyTime": "*time.Duration", "HealthyDeadline": "*time.Duration",
        "ProgressDeadline": "*time.Duration", "Canary": "*int", "AutoRevert": "*bool",
        "AutoPromote": "*bool",
    },
    "RestartPolicy": {
        "Interval": "*time.Duration", "Attempts": "*int", "Delay": "*time.Duration",
        "Mode": "*string", "RenderTemplates": "*bool",
    },
    "ReschedulePolicy": {
        "Attempts": "*int", "Interval": "*time.Duration", "Delay": "*time.Duration",
        "DelayFunction": "*string", "MaxDelay": "*time.Duration", "Unlimited": "*bool",
    },
    "MigrateStrategy": {
        "MaxParallel": "*int", "HealthCheck": "*string", "MinHealthyTime": "*time.Duration",
        "HealthyDeadline": "*time.Duration",
    },
    "EphemeralDisk": {
        "Sticky": "*bool", "Migrate": "*bool", "SizeMB": "*int",
    },
    "LogConfig": {
        "MaxFiles": "*int", "MaxFileSizeMB": "*int", "Enabled": "*bool", "Disabled": "*bool",
    },
    "Template": {
        "SourcePath": "*string", "DestPath": "*string", "EmbeddedTmpl": "*string",
        "ChangeMode": "*string", "ChangeScript": "*ChangeScript", "ChangeSignal": "*string",
        "Once": "*bool", "Splay": "*time.Duration", "Perms": "*string", "Uid": "*int",
        "Gid": "*int", "LeftDelim": "*string", "RightDelim": "*string", "Envvars": "*bool",
        "VaultGrace": "*time.Duration", "Wait": "*WaitConfig", "ErrMissingKey": "*bool",
    },
    "ScalingPolicy": {
        "Min": "*int64", "Max": "*int64", "Policy": "map[string]any", "Enabled": "*bool",
        "Type": "string", "ID": "string", "Namespace": "string", "Target": "map[string]string",
        "CreateIndex": "uint64", "ModifyIndex": "uint64",
    },
    "ScalingRequest": {
        "Count": "*int64", "Target": "map[string]string", "Message": "string", "Error": "bool",
        "Meta": "map[string]any", "Region": "string", "Namespace": "string",
        "SecretID": "string", "PolicyOverride": "bool", "JobModifyIndex": "uint64",
    },
}

SUPPLEMENT: dict[str, dict[str, str]] = {
    # hashicorp/nomad api/jobs.go: the envelopes of plan and validate.
    "JobPlanRequest": {
        "Job": "*Job", "Diff": "bool", "PolicyOverride": "bool",
        "Region": "string", "Namespace": "string", "SecretID": "string",
    },
    "JobValidateRequest": {
        "Job": "*Job", "Region": "string", "Namespace": "string", "SecretID": "string",
    },
    "JobSubmission": {
        "Source": "string", "Format": "string", "VariableFlags": "map[string]string",
        "Variables": "string",
    },
    # api/tasks.go
    "TaskLifecycle": {"Hook": "string", "Sidecar": "bool"},
    "VolumeRequest": {
        "Name": "string", "Type": "string", "Source": "string", "ReadOnly": "bool",
        "Sticky": "bool", "AccessMode": "string", "AttachmentMode": "string",
        "MountOptions": "*CSIMountOptions", "PerAlloc": "bool",
    },
    "CSIMountOptions": {"FSType": "string", "MountFlags": "[]string"},
    "VolumeMount": {
        "Volume": "*string", "Destination": "*string", "ReadOnly": "*bool",
        "PropagationMode": "*string", "SELinuxLabel": "*string",
    },
    "TaskArtifact": {
        "GetterSource": "*string", "GetterOptions": "map[string]string",
        "GetterHeaders": "map[string]string", "GetterMode": "*string",
        "GetterInsecure": "*bool", "RelativeDest": "*string", "Chown": "bool",
    },
    "ChangeScript": {
        "Command": "*string", "Args": "[]string", "Timeout": "*time.Duration",
        "FailOnError": "*bool", "RunOnFirstRender": "*bool",
    },
    "WaitConfig": {"Min": "*time.Duration", "Max": "*time.Duration"},
    "DisconnectStrategy": {
        "LostAfter": "*time.Duration", "StopOnClientAfter": "*time.Duration",
        "Replace": "*bool", "Reconcile": "*string",
    },
    "DispatchPayloadConfig": {"File": "string"},
    "Vault": {
        "Policies": "[]string", "Role": "string", "Namespace": "*string", "Cluster": "string",
        "Env": "*bool", "DisableFile": "*bool", "ChangeMode": "*string",
        "ChangeSignal": "*string", "AllowTokenExpiration": "*bool",
    },
    # api/resources.go, api/services.go, api/consul.go
    "DNSConfig": {"Servers": "[]string", "Searches": "[]string", "Options": "[]string"},
    "CNIConfig": {"Args": "map[string]string"},
    "NUMAResource": {"Affinity": "string", "Devices": "[]string"},
    "ServiceWeights": {"Passing": "int", "Warning": "int"},
    "Consul": {"Namespace": "string", "Cluster": "string", "Partition": "string"},
    # api/jobs.go
    "PeriodicConfig": {
        "Enabled": "*bool", "Spec": "*string", "Specs": "[]string", "SpecType": "*string",
        "ProhibitOverlap": "*bool", "TimeZone": "*string",
    },
    "ParameterizedJobConfig": {
        "Payload": "string", "MetaRequired": "[]string", "MetaOptional": "[]string",
    },
    # api/jobs.go:1008-1016: the job's ui block (docs/nomad-api.md §1.9)
    "JobUIConfig": {"Description": "string", "Links": "[]*JobUILink"},
    "JobUILink": {"Label": "string", "URL": "string"},
    "JobVersionTag": {"Name": "string", "Description": "string", "TaggedTime": "int64"},
}

# Accepted as any JSON object (see the module docstring).
OPAQUE: frozenset[str] = frozenset({
    "Multiregion", "ConsulConnect", "WorkloadIdentity", "Secret", "Action",
    "TaskSchedule", "TaskCSIPluginConfig",
})

STRUCTS: dict[str, dict[str, str]] = {**REFERENCE, **SUPPLEMENT}


def strip_annotation(go_type: str) -> str:
    """``"bool  [omitempty]"`` → ``"bool"``, as the reference file annotates some types."""
    return go_type.split("  ", maxsplit=1)[0].split(" (", maxsplit=1)[0].strip()
