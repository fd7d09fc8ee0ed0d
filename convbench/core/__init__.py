"""The core: problems, measurements and result rows, statistics, formatting; pure data and math."""
