set -o pipefail
export PYTHONUNBUFFERED=1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())"
timeout 130 python3 -m pytest -n 8 -v -rf -p no:cacheprovider tests/test_triton_attention.py 2>&1 | grep -v PASSED | tee $OUT/pytest.log | tail -25
timeout 110 python3 -m wmtp.cli bench attention --device cuda --contexts 16384 1048576 --rep-ms 20 --methods triton_window triton_window_paged triton_full triton_full_paged sdpa_full gather_sdpa_window sdpa_compact_window --out $OUT/bench.json --plot $OUT/bench.png 2>&1 | tee $OUT/bench.log | tail -40
