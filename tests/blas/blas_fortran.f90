! blas_fortran.f90 - a plain Fortran program (linked with -lblas only) that calls DGEMM and
! SGEMM, each product checked against a double-precision loop.
!
!     blas_fortran [n=200]
!
! Every combination of transposes ('N', 'T', 'C'), leading dimensions larger than the
! matrices (sub-blocks of bigger arrays), alpha and beta (beta = 0 with NaN in C, which BLAS
! must ignore; beta = 1 accumulates), and the rows of C outside the product untouched.
! tests/e2e/test_blas.py runs it under LD_PRELOAD=libgemm_blas.so against a real daemon.
! Prints one line per product ("ok" or "BAD ...") and a last line "products N bad M";
! stops with status 1 when a product is wrong.
program blas_fortran
  implicit none
  external :: dgemm, sgemm
  integer :: n, m, k, lda, ldb, ldc, ia, ib, products, bad, i, j, l, iarg
  character(len=1), parameter :: tr(3) = (/ 'N', 'T', 'C' /)
  character(len=16) :: arg
  double precision, allocatable :: a(:,:), b(:,:), c(:,:), c0(:,:), ref(:,:)
  real, allocatable :: as(:,:), bs(:,:), cs(:,:)
  double precision :: alpha, beta, s, tol, x, y, mag, nan
  real :: alphas, betas

  n = 200
  iarg = command_argument_count()
  if (iarg >= 1) then
    call get_command_argument(1, arg)
    read (arg, *) n
  end if
  m = n + 7
  k = n - 5
  lda = n + 13
  ldb = n + 11
  ldc = m + 3
  nan = 0d0
  nan = nan / nan
  products = 0
  bad = 0

  allocate (a(lda, n + 13), b(ldb, n + 11), c(ldc, n + 1), c0(ldc, n + 1), ref(m, n))
  allocate (as(lda, n + 13), bs(ldb, n + 11), cs(ldc, n + 1))
  call random_seed()
  call random_number(a)
  call random_number(b)
  ! values exactly representable in single precision: one reference for both routines
  a = dble(real(a - 0.5d0))
  b = dble(real(b - 0.5d0))
  as = real(a)
  bs = real(b)

  do ia = 1, 3
    do ib = 1, 3
      do i = 0, 1
        if (i == 0) then
          alpha = 1d0; beta = 0d0
        else
          alpha = -0.5d0; beta = 1d0
        end if
        ! reference: op(A) is m x k, op(B) is k x n
        call random_number(c0)
        c0 = dble(real(c0))
        if (beta == 0d0) c0(1:m, 1:n) = nan
        do j = 1, n
          do l = 1, m
            s = 0d0
            mag = 0d0
            do iarg = 1, k
              if (tr(ia) == 'N') then
                x = a(l, iarg)
              else
                x = a(iarg, l)
              end if
              if (tr(ib) == 'N') then
                y = b(iarg, j)
              else
                y = b(j, iarg)
              end if
              s = s + x * y
              mag = mag + abs(x * y)
            end do
            if (beta == 0d0) then
              ref(l, j) = alpha * s
            else
              ref(l, j) = alpha * s + beta * c0(l, j)
            end if
          end do
        end do

        c = c0
        call dgemm(tr(ia), tr(ib), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        tol = 1d-12 * k
        call check('DGEMM', tol)

        cs = real(c0)
        alphas = real(alpha)
        betas = real(beta)
        call sgemm(tr(ia), tr(ib), m, n, k, alphas, as, lda, bs, ldb, betas, cs, ldc)
        c = dble(cs)
        tol = 4d-6 * k
        call check('SGEMM', tol)
      end do
    end do
  end do
  print '(a, i0, a, i0)', 'products ', products, ' bad ', bad
  deallocate (a, b, c, c0, ref, as, bs, cs)
  if (bad /= 0) stop 1

contains

  subroutine check(name, tol)
    character(len=*), intent(in) :: name
    double precision, intent(in) :: tol
    double precision :: err
    logical :: pad_ok
    err = maxval(abs(c(1:m, 1:n) - ref))
    ! rows m+1..ldc and column n+1 of C are outside the product and must be untouched
    pad_ok = all(c(m + 1:ldc, 1:n) == c0(m + 1:ldc, 1:n)) .and. all(c(:, n + 1) == c0(:, n + 1))
    products = products + 1
    if (.not. (err <= tol) .or. .not. pad_ok) then
      bad = bad + 1
      print '(a, a, 1x, a, a, a, 2(1x, es10.3), a, l1)', 'BAD ', name, tr(ia), tr(ib), ' err/tol', err, tol, &
        ' padding kept ', pad_ok
    else
      print '(a, 1x, a, 1x, a, a, a, es10.3)', 'ok', name, tr(ia), tr(ib), ' max error ', err
    end if
  end subroutine check

end program blas_fortran
