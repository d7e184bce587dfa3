"""Problems and prompts: datasets, reasoning-gym tasks, answer extraction and prompt rendering."""
