"""The profiler views rendered: the terminal sections, the HTML sections and their overview."""
