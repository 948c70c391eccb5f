"""How work lands on disk and splits over processes: atomic, journaled writes under a folder
lock (`atomic`), and work shared by torchrun ranks (`ranks`). Imports nothing above `common`."""
