"""What every layer uses: the plug-in registry, derived seeds, console output, the code version."""
