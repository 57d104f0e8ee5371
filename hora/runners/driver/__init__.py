"""The driver's side of a run: its service (rendezvous, results, failures), the monitor
that watches a job, fault classification, relaunch accounting, the console's progress
and the store channel for ranks that cannot reach the driver."""
