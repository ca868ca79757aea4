"""Running the rollout -> train loop: run-level flags, logging and (later) Ray placement."""
