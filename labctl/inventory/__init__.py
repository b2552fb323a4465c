"""The inventory: the lab's machines as data, loaded from YAML and validated."""
