/* zt_bpe.c — being written */
