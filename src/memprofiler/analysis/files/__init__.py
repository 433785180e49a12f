"""Reading files safely: URLs, gzip, restricted unpickling, integrity-checked YAML."""
