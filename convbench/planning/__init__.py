"""From results to training code: advice, the layout plan, plans and their store, tune and apply."""
