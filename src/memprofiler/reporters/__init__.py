"""One module per output format; each only renders a :class:`~memprofiler.reporters.model.ReportModel`."""
