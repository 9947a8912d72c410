"""Redis: the broker, its key names and Lua scripts. The only package that imports redis-py."""
