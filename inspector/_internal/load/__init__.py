"""What the model code would load: the model built on the meta device from config.json, sealed."""
