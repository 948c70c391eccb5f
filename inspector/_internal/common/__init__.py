"""The shared tables and helpers every layer may import (file names, units, dtypes, words, display);
they import nothing of the project above them."""
