# Sourced by tools/setup-deps.sh and tools/check-cross.sh (bash).
#
# retry CMD...: runs CMD, and where it fails, again after 30, 60 and 90
# seconds (four tries in all), for apt's fetches: a Debian mirror in the
# middle of a sync serves index files of the wrong size for a while
# ("File has unexpected size ... Mirror sync in progress?"), and apt-get
# then exits 100. That failed a clean-clone CI run's i386 sysroot fetch on
# 2026-12-05 with every test before it passed. Returns CMD's last status.
retry() {
  local try status
  for try in 1 2 3 4; do
    status=0
    "$@" || status=$?
    [ "$status" -eq 0 ] && return 0
    [ "$try" -lt 4 ] || break
    echo "retry: '$*' failed (status $status, try $try of 4); again in $((try * 30)) s" >&2
    sleep $((try * 30))
  done
  return "$status"
}
