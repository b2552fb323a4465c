"""Phase 3 as a whole: the join of the trainer (labctl/train), the orchestra and the sandbox
service, which no one of them owns. `bench` measures it (`labctl bench phase3`). The loop
itself runs in the reference trainer (labctl/agent/train/phase3.py).
"""
