"""`labctl provision`: playbooks of resources, each read → planned as data → applied → verified."""
