"""Code that runs where the model runs: build, compile, warm, check, benchmark."""
