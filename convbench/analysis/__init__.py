"""Results into answers: ranking with ties, the reports, comparisons, speed-ups, summaries."""
