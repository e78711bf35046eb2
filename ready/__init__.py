"""ReaDy: recurrent states as dynamic context for speculative drafting (the method as a library)."""
