set -eu
target="$DROVER_TARGET_VERSION"
marker="/drover-state/attempt-$DROVER_ATTEMPT"
current="$(apiclient get os.version_id | sed -n 's/.*"version_id"[^"]*"\([^"]*\)".*/\1/p')"
if [ "$current" = "$target" ]; then
  echo "node $DROVER_NODE_NAME runs $target"
  exit 0
fi
if [ -e "$marker" ]; then
  echo "node $DROVER_NODE_NAME rebooted for $target but runs ${current:-an unknown version}" >&2
  exit 1
fi
apiclient set updates.version-lock="$target" updates.ignore-waves=true
apiclient update check
apiclient update apply
touch "$marker"
echo "rebooting $DROVER_NODE_NAME into $target"
apiclient reboot
# The reboot takes this pod down; exiting first would report success too early.
sleep 3600
echo "no reboot within an hour" >&2
exit 1
