"""The seed notes' workloads: network, data and protocol of each."""
