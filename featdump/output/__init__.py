"""Output: the HDF5 file and everything around it. `layout` owns the file's layout (datasets, attributes,
counters) and reads it back (`Output`), `netcdf` names its datasets' dimensions and coordinates (NetCDF-4, so
xarray opens it); `writer` appends and commits batches to OUT.partial, `write_behind` does
so on a thread behind the forward, after `storage` casts the rows to the storage dtype, and
`repair` drops what a kill left past the last commit; `fingerprint` says
which runs may resume, update or merge a file; `lock` keeps two jobs off one output; `update` stages new images
and joins them in one short commit; `shard_files` names the shards of a job and `merge` joins them; `progress` is
the record beside a running job that `featdump info` reads; `space` checks the disk before writing."""
