"""The file formats the controller reads: QoS policy files (`qosfile`, YAML/JSON, and OpenSM's
`qos-policy.conf` in `opensmqos`, either through `qosload`) and partition files (`partitions_file`: OpenSM's
`partitions.conf` or YAML).  Each validates in layers and raises one error naming the line and the field;
the models they produce are the subnet manager's (`controller.sm`).  OpenSM's routing dumps are written and
read by `controller.sm.opensm` (pure text, used by the engines' checks)."""
