"""The fault-injection suite's parts: the recording sink, the workload, the fault schedule."""
