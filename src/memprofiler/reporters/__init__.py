"""The report of a run, shaped once (``model/``) and rendered per format: the terminal and the HTML
page, the profiler views (``traces/``), the allocation explorer (``explorer/``), from HTML pieces
every page shares (``parts/``)."""
