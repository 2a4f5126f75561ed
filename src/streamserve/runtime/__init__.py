"""What a streamserve process is made of: settings, logging set-up, child processes, the embedded Redis."""
