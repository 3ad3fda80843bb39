#!/bin/sh
# /init of the multi-node VM: runs tierflow inside and prints results between markers.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "TIERFLOW-VM-KERNEL $(cat /proc/version)"
echo "TIERFLOW-VM-TOPO-BEGIN"
/bin/tierflow topo --json
echo "TIERFLOW-VM-TOPO-END $?"
echo "TIERFLOW-VM-VERIFY-BEGIN"
/bin/tierflow topo --verify --json
echo "TIERFLOW-VM-VERIFY-END $?"
echo "TIERFLOW-VM-TABLE-BEGIN"
/bin/tierflow topo
echo "TIERFLOW-VM-TABLE-END"
echo "TIERFLOW-VM-DEMO-BEGIN"
/bin/tierflow demo --layers 2 --width 64 --batch 8 --samples 16 --steps 4 --log-every 0 \
  --placement "optimizer_state=cxl1;master_params=cxl0" --json --out /tmp/demo
echo "TIERFLOW-VM-DEMO-END $?"
echo "TIERFLOW-VM-TESTS-BEGIN"
/bin/multinode_tests --reporter compact --success >/tmp/tests.log 2>&1
status=$?
tail -n 60 /tmp/tests.log
echo "TIERFLOW-VM-TESTS-END $status"
echo "TIERFLOW-VM-DONE"
poweroff -f
