/* zt_optim.c — being written */
