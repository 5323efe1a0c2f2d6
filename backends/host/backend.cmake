# The host backend: plain host memory, always built.
list(APPEND AB_SOURCES backends/host/host.c)
list(APPEND AB_BACKEND_TABLES ab__backend_host)
list(APPEND AB_BACKENDS "host")
