"""Search the tuning space per problem bucket on the local GPU (Optuna), gate every
candidate on correctness, and store the winners."""
