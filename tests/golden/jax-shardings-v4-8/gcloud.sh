gcloud alpha compute tpus queued-resources create jax-shardings \
    --project=my-project \
    --zone=us-central2-b \
    --accelerator-type=v4-8 \
    --runtime-version=tpu-ubuntu2204-base \
    --node-id=jax-shardings \
    --valid-until-duration=2h \
    --labels=managed-by=tpuctl,tpuctl-job=jax-shardings,tpuctl-spec-hash=27c4e6201344,tpuctl-run=jax-shardings \
    --metadata-from-file=startup-script=startup.sh
