"""Engines: a job's shards fanned out over a cluster's workers (`ray`: one Ray task per shard). An engine runs the
same `job.staging.extract` a process runs, for each shard, and the same merge; it adds scheduling, retries and
progress over the shards, nothing else. Beside `faces`, above `job`; its cluster's package is an extra, imported
only in its module."""
