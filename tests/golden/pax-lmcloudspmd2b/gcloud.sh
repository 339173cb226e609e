gcloud alpha compute tpus queued-resources create pax-2b \
    --project=my-project \
    --zone=us-central2-b \
    --accelerator-type=v4-8 \
    --runtime-version=tpu-ubuntu2204-base \
    --node-id=pax-2b \
    --valid-until-duration=4h \
    --labels=managed-by=tpuctl,tpuctl-job=pax-2b,tpuctl-spec-hash=9237149e61be,tpuctl-run=pax-2b \
    --metadata-from-file=startup-script=startup.sh \
    --autocheckpoint-enabled
