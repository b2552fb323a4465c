"""Reading the YAML documents a user writes (inventory aside, which has its own package):
positions for error messages (`yamlpos`), the shared field checks (`validation`), the files
labctl falls back to (`defaults`) and the starter files `labctl init` writes (`starter`)."""
