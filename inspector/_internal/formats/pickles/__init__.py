"""Every pickle a checkpoint holds is read here, and only here: the audit, the restricted
unpickler and its allow-list, the stand-ins, the bounded child, the common state's torch
reader (SECURITY.md, "Nothing in a checkpoint runs code")."""
