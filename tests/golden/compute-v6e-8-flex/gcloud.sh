# --provisioning-model=FLEX_START: gcloud alpha has it, GA does not
# --graceful-shutdown: gcloud beta has it, GA does not
# no gcloud flag for params.requestValidForDuration (30m): tpuctl create sends it through the API
gcloud alpha compute instances create flex-v6e \
    --project=my-project \
    --zone=us-central2-b \
    --machine-type=ct6e-standard-8t \
    --image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e \
    --image-project=ubuntu-os-accelerator-images \
    --network=default \
    --maintenance-policy=TERMINATE \
    --provisioning-model=FLEX_START \
    --instance-termination-action=DELETE \
    --max-run-duration=1d \
    --graceful-shutdown \
    --graceful-shutdown-max-duration=5m \
    --labels=team=llm,managed-by=tpuctl,tpuctl-job=flex-v6e,tpuctl-spec-hash=45400437df84,tpuctl-run=flex-v6e \
    --scopes=https://www.googleapis.com/auth/cloud-platform \
    --metadata-from-file=startup-script=startup.sh \
    --metadata=tpuctl-record=gs://my-bucket/flex-v6e/tpuctl/flex-v6e,enable-guest-attributes=TRUE
