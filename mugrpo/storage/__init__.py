"""Object storage: the store, the one place that builds paths, the storage faults a user can fix."""
