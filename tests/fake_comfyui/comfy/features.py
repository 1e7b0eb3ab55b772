KNOWS_SEEDVR2 = True
TINY_CONFIGS = True  # False: like core, build only the released configurations (tiny weights fail to load)
