"""The allocation explorer: one offline HTML page per allocator history or OOM record."""
