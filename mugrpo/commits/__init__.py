"""What a run commits: manifests (the commit points), policy folders and Parquet tables."""
