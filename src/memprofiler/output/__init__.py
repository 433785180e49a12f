"""Where collected data becomes files: atomic writers, the snapshot cache, the Chrome-trace timeline."""
