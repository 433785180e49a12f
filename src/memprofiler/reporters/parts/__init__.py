"""Pieces every HTML page shares: the page shell, cells and tables, inline SVG charts, one snapshot's summary."""
