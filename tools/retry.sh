# shellcheck shell=bash
# Sourced by tools/setup-deps.sh and tools/check-cross.sh.
#
# retry CMD...: runs CMD, and where it fails, again after 20 and 40
# seconds (three tries in all), for apt's fetches: a Debian mirror in the
# middle of a sync serves files of the wrong size for a while ("File has
# unexpected size ... Mirror sync in progress?"), and apt-get then exits
# 100. Returns CMD's last status.
retry() {
  local try status
  for try in 1 2 3; do
    status=0
    "$@" || status=$?
    [ "$status" -eq 0 ] && return 0
    [ "$try" -lt 3 ] || break
    echo "retry: '$*' failed (status $status, try $try of 3); again in $((try * 20)) s" >&2
    sleep $((try * 20))
  done
  return "$status"
}

# retry_update CMD...: an `apt-get ... update` of several sources through
# retry, whose last failure is a warning and status 1, which the caller
# may let pass: apt keeps every index it did fetch, and an install after
# it fails by itself where what it needs is in none of them (`apt-cache
# depends` does not, so a caller of that checks). On 2026-12-05 the mirror
# served bookworm-security's i386 index at the wrong size for hours (a
# clean-clone CI run failed at the i386 sysroot fetch, every test before it
# passed), while the main suite's, which holds every package asked for,
# was right.
retry_update() {
  retry "$@" && return 0
  echo "retry: '$*' failed on every try; going on with the indexes apt did fetch" >&2
  return 1
}
