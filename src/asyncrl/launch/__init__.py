"""Starting roles as child processes: locally now, on Ray later."""
