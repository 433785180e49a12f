"""The report model: the figures a report shows, shaped once from a run for every format."""
